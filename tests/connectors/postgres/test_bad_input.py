"""The catalogue of bad input, through the CLI against real servers: for each, one clear line (and
a hint), the documented exit code, and a target left exactly as it was (no staging table either).
Config, connection, schema, strategy and data errors; more live beside their connectors' tests."""

from __future__ import annotations

import pytest

from conveyor.testing.pgserver import free_port
from tests.helpers import PG_PASSWORD, pg_exec


@pytest.fixture(scope="module")
def tables(pg_source, pg_target):
    pg_exec(pg_source, "DROP TABLE IF EXISTS bad_src CASCADE", "CREATE TABLE bad_src (id int, name text, blob bytea)",
            "INSERT INTO bad_src VALUES (1, 'a', '\\x01'), (2, 'b', '\\x02')", "CREATE VIEW bad_view AS SELECT * FROM bad_src")
    # bad_alike takes bad_src's rows as they are: the strategy's refusals are not preceded by the target's
    pg_exec(pg_target, "DROP TABLE IF EXISTS bad_alike", "CREATE TABLE bad_alike (id int, name text, blob bytea)")
    pg_exec(pg_target, "DROP TABLE IF EXISTS bad_dst CASCADE", "CREATE TABLE bad_dst (id int, name text, blob int)",
            "INSERT INTO bad_dst VALUES (42, 'keep', 0)", "CREATE VIEW bad_dst_view AS SELECT * FROM bad_dst",
            "DROP ROLE IF EXISTS reader", f"CREATE ROLE reader LOGIN PASSWORD '{PG_PASSWORD}'",
            "GRANT SELECT ON bad_dst TO reader")
    return pg_source, pg_target


def _args(src, dst, *extra: str) -> list[str]:
    return ["run", "source=postgres", f"source.port={src.port}", "source.table=bad_src", "sink=postgres",
            f"sink.port={dst.port}", "sink.table=bad_dst", "strategy=none", "load_mode=truncate", *extra]


CASES = [
    ("wrong password", ["source.password_env=CONVEYOR_WRONG_PW"], 3, ["password authentication failed", "hint: check the user, and the password in $CONVEYOR_WRONG_PW as set on "]),
    ("unreachable port", ["source.port={free}"], 3, ["cannot connect", "hint: is the server running and reachable at 127.0.0.1:"]),
    ("missing table", ["source.table=nope"], 4, ["error: postgres source: table public.nope does not exist"]),
    ("missing target", ["sink.table=nope"], 4, ["error: postgres table public.nope does not exist", "load_mode=create"]),
    ("ctid on a view", ["source.table=bad_view", "strategy=ctid", "sink.table=bad_alike"], 2, ["public.bad_view is a view, which has no ctid", "hint: use strategy=rangeid or ntile"]),
    ("missing key", ["strategy=rangeid", "strategy.distribute_key=nope", "sink.table=bad_alike"], 4, ["distribute_key 'nope' is not a column", "columns are: id, name, blob"]),
    ("text key for rangeid", ["strategy=rangeid", "strategy.distribute_key=name", "sink.table=bad_alike"], 2, ["distribute_key 'name' is not numeric", "strategy=ntile"]),
    ("no key", ["strategy=random", "sink.table=bad_alike"], 2, ["strategy.distribute_key: strategy=random needs a distribute key"]),
    ("incompatible type", ["sink.copy_path=arrow"], 4, ["column blob (bytea -> integer): the values would change meaning",
                                                         "sink.allow_cast=[blob]"]),
    ("date into integer", ["source.table=null", "source.query='SELECT id, name, make_date(1996, 1, 2) AS blob FROM bad_src'"], 4,
     ["column blob (date -> integer): the values would change meaning", "hint: cast it in source.query"]),
    ("text into integer", ["source.table=null", "source.query='SELECT id, name, name AS blob FROM bad_src'"], 4,
     ["column blob (text -> integer): the text would be parsed"]),
    ("allowed cast PostgreSQL cannot make", ["sink.allow_cast=[blob]"], 4,
     ["column blob (binary -> integer): PostgreSQL cannot cast it: cannot cast type bytea to integer"]),
    ("allowed cast a value refuses", ["source.table=null", "source.query='SELECT id, name, name AS blob FROM bad_src'",
                                      "sink.allow_cast=[blob]"], 5,
     ['invalid input syntax for type integer: "a" (in PostgreSQL\'s cast of column blob to integer)']),
    ("forced passthrough", ["sink.copy_path=passthrough", "source.table=null",
                            "source.query='SELECT id, name, 7::int2 AS blob FROM bad_src'"], 4,
     ["copy_path=passthrough is not possible: column blob: smallint -> integer differ"]),
    ("bad copy_path", ["sink.copy_path=fast"], 2, ["copy_path: 'fast' is not one of auto, arrow, passthrough"]),
    ("unknown key", ["+sink.tabel=x"], 2, ["error: sink.tabel: unknown key"]),
    ("wrong type", ["batch_size=abc"], 2, ["error: batch_size:", "abc"]),
    ("wrong bool", ["sink.unlogged=maybe"], 2, ["error: sink.unlogged:", "maybe"]),
    ("unknown strategy", ["strategy.type=nope"], 2, ["error: unknown strategy 'nope'", "available strategy plugins:"]),
    ("unknown runtime", ["runtime.type=nope"], 2, ["error: unknown runtime 'nope'", "local, ray"]),
    ("bad load_mode", ["load_mode=upsert"], 2, ["error: load_mode: 'upsert' is not one of truncate, append, create, replace, merge"]),
    ("bad verify", ["verify=md5"], 2, ["error: verify: 'md5' is not one of count, checksum, none"]),
    ("zero degree", ["degree=0"], 2, ["error: degree: 0 is not valid"]),
    ("query on a missing table", ["source.table=null", "source.query='SELECT * FROM nope'"], 4, ["relation \"nope\" does not exist"]),
    ("query with bad SQL", ["source.table=null", "source.query='SELEC 1'"], 2, ["syntax error", "hint: check the SQL of the query"]),
    ("position with fewer columns", ["source.table=null", "source.query='SELECT id, name FROM bad_src'", "map_method=position"], 4,
     ["the source has 2 columns, the target 3"]),
    ("a value that does not fit", ["source.table=null", "source.query='SELECT id, name, id * 3000000000 AS blob FROM bad_src'",
                                   "sink.copy_path=arrow"], 5, ["column blob -> blob: a value does not fit int32"]),
    ("missing target schema", ["sink.schema=nope"], 4, ["error: postgres table nope.bad_dst: schema nope does not exist",
                                                        'hint: create it (CREATE SCHEMA "nope") or set sink.schema']),
    ("view as target", ["sink.table=bad_dst_view", "load_mode=append"], 4,
     ["postgres table public.bad_dst_view is a view: Conveyor loads tables"]),
    ("read-only role", ["sink.user=reader"], 4,
     ["role reader lacks CREATE on schema public (for the staging table)", "INSERT on public.bad_dst", "TRUNCATE on public.bad_dst",
      "hint: grant it, or connect as a role that has it"]),
    ("read-only role, replace", ["sink.user=reader", "load_mode=replace"], 4, ["ownership of public.bad_dst (replace drops it)"]),
    ("target unreachable", ["sink.port={free}"], 3, ["cannot connect", "hint: is the server running"]),
    ("target wrong password", ["sink.password_env=CONVEYOR_WRONG_PW"], 3, ["password authentication failed"]),
    ("missing password file", ["sink.password_file=/nonexistent/pw"], 2, ["password_file '/nonexistent/pw': No such file or directory"]),
]


@pytest.mark.parametrize(("name", "extra", "code", "needles"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(tables, cli, name: str, extra: list[str], code: int, needles: list[str]) -> None:
    src, dst = tables
    extra = [e.replace("{free}", str(free_port())) for e in extra]
    res = cli(*_args(src, dst, *extra), env={"CONVEYOR_WRONG_PW": "not-the-password"})
    assert res.code == code, (res.code, res.out, res.err)
    assert "Traceback" not in res.err + res.out
    assert len(res.error_lines) == 1, res.err
    for needle in needles:
        assert needle in res.err, res.err
    assert PG_PASSWORD not in res.err + res.out
    assert pg_exec(dst, "SELECT * FROM bad_dst") == [(42, "keep", 0)]
    assert pg_exec(dst, "SELECT count(*) FROM pg_class WHERE relname LIKE '_conveyor_stage%'")[0][0] == 0
