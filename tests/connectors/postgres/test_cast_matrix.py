"""The cast matrix: every type of the type matrix into every other, PostgreSQL -> PostgreSQL on the
Arrow path. Each pair either copies every value exactly or is refused in prepare, naming the
column and both types, with the target untouched.

For each source type X: a target table with one column per type Y, loaded from a query that reads
X into all of them. The refusal (one error, every refused column listed) tells which pairs the
policy refuses; the rest are then loaded, and each value must equal PostgreSQL's own cast of the
source value to Y *and* that cast must come back to the same X value (nothing was lost). On the
main this started from, date -> integer loaded days since 1970 and exited 0.
"""

from __future__ import annotations

import re

import pytest

from conveyor.errors import SchemaError, TransferError
from tests.helpers import job, pg_exec

# name -> (DDL type, two sample values as SQL literals)
TYPES = {
    "i2": ("int2", ["1", "-7"]), "i4": ("int4", ["1", "-7"]), "i8": ("int8", ["1", "-7"]),
    "n4": ("numeric(18,4)", ["12.5", "-0.0001"]), "n2": ("numeric(18,2)", ["12.5", "-3.25"]),
    "nu": ("numeric", ["12.5", "-3.25"]), "f4": ("float4", ["1.25", "-0.5"]), "f8": ("float8", ["2.5", "-0.25"]),
    "b": ("bool", ["true", "false"]), "t": ("text", ["'ab'", "'é!'"]), "vc": ("varchar(40)", ["'ab'", "'é!'"]),
    "ch": ("char(2)", ["'ab'", "'é!'"]), "by": ("bytea", ["'\\x00ff'", "'\\x'"]),
    "d": ("date", ["'2024-02-29'", "'0001-01-01'"]),
    "ts": ("timestamp", ["'2024-02-29 12:34:56.123456'", "'1970-01-01 00:00:00'"]),
    "ts3": ("timestamp(3)", ["'2024-02-29 12:34:56.123'", "'1970-01-01 00:00:00'"]),
    "tz": ("timestamptz", ["'2024-02-29 12:34:56.654321+02'", "'1999-12-31 23:59:59+00'"]),
    "tm": ("time", ["'23:59:59.999999'", "'00:00:00'"]), "iv": ("interval", ["'1 year 2 mons 3 days 04:05:06.789'", "'-1 days'"]),
    "u": ("uuid", ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'00000000-0000-0000-0000-000000000000'"]),
    "j": ("json", ["'{\"a\": [1, 2]}'", "'[]'"]), "jb": ("jsonb", ["'{\"a\": [1, 2]}'", "'[]'"]),
    "ia": ("int4[]", ["'{1,NULL,3}'", "'{}'"]), "ip": ("inet", ["'192.168.1.0/24'", "'::1'"]),
    "m": ("cm_mood", ["'happy'", "'sad'"]),
}
# text written into a type whose text form it must be
TEXT_FOR = {"u": TYPES["u"][1], "j": ["'{}'", "'[]'"], "jb": ["'{}'", "'[]'"], "m": TYPES["m"][1]}
TEXT = {"t", "vc", "ch"}
# char(2) holds no uuid and no label of cm_mood: those pairs are judged, not loaded (a value too
# long for char(2) is PostgreSQL's own error)
TOO_WIDE = {("ch", "u"), ("ch", "m")}

MUST_REFUSE = [("d", "i4"), ("ts", "i8"), ("b", "i4"), ("i4", "b"), ("f8", "i8"), ("f8", "n4"), ("tz", "ts"), ("ts", "tz"),
               ("t", "i4"), ("t", "d"), ("t", "ts"), ("t", "b"), ("n4", "n2"), ("nu", "n4"), ("f8", "f4"),
               ("i4", "t"), ("d", "t"), ("by", "t"), ("t", "by"), ("ip", "u")]
# allowed by their types, each value checked (test_fractions.py): the sample's microseconds are refused by name
VALUE_CHECKED = {("ts", "ts3")}
MUST_ALLOW = [("i2", "i8"), ("i8", "i4"), ("i4", "n4"), ("i4", "f8"), ("f4", "f8"), ("n2", "n4"), ("n4", "nu"), ("vc", "t"),
              ("t", "vc"), ("t", "j"), ("t", "u"), ("t", "m"), ("m", "t"), ("j", "jb"), ("j", "t"), ("d", "ts"), ("ts3", "ts"),
              ("ip", "t"), ("nu", "nu"), ("ip", "ip"), ("ia", "ia")]


@pytest.fixture(scope="module")
def mood(pg_source, pg_target):
    for server in (pg_source, pg_target):
        pg_exec(server, "DROP TYPE IF EXISTS cm_mood CASCADE", "CREATE TYPE cm_mood AS ENUM ('sad', 'happy')")


def _value(x: str, y: str, i: int) -> str:
    samples = TEXT_FOR.get(y, TYPES[x][1]) if x in TEXT else TYPES[x][1]
    return f"({samples[i]})::{TYPES[x][0]}"


def _query(x: str, ys: list[str]) -> str:
    cols = ", ".join(f"(CASE i WHEN 1 THEN {_value(x, y, 0)} WHEN 2 THEN {_value(x, y, 1)} END)::{TYPES[x][0]} AS y_{y}"
                     for y in ys)
    return f"SELECT i AS id, {cols} FROM (VALUES (1), (2), (3)) v(i)"


def _target(server, ys: list[str]) -> None:
    cols = ", ".join(f"y_{y} {TYPES[y][0]}" for y in ys)
    pg_exec(server, "DROP TABLE IF EXISTS cast_matrix", f"CREATE TABLE cast_matrix (id int4, {cols})")


@pytest.mark.parametrize("x", list(TYPES))
def test_each_pair_copies_exactly_or_is_refused_by_name(mood, pg_source, pg_target, x: str) -> None:
    src = {"type": "postgres", "port": pg_source.port, "query": None}
    dst = {"type": "postgres", "port": pg_target.port, "table": "cast_matrix", "copy_path": "arrow"}
    ys = list(TYPES)
    _target(pg_target, ys)
    refused: set[str] = set()
    try:
        job({**src, "query": _query(x, ys)}, dst, load_mode="append")
    except SchemaError as exc:
        found = [m.groups() for chunk in exc.message.split("column y_")[1:]
                 if (m := re.match(r"(\w+) \((.+?) -> (.+?)\): ([^;(]+)", chunk))]
        assert found, exc.message
        refused = {y for y, *_ in found}
        shown = dict(pg_exec(pg_target, "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                                        "WHERE attrelid = 'cast_matrix'::regclass AND attnum > 0"))
        for y, shown_src, shown_dst, why in found:  # both types named, and why
            assert shown_src.strip() and shown_dst == shown[f"y_{y}"] and why.strip(), (x, y, exc.message)
        assert "sink.allow_cast=[" in exc.hint
        assert pg_exec(pg_target, "SELECT count(*) FROM cast_matrix")[0][0] == 0  # untouched
    for a, b in MUST_REFUSE:
        if a == x:
            assert b in refused, f"{TYPES[a][0]} -> {TYPES[b][0]} must be refused"
    for a, b in MUST_ALLOW:
        if a == x:
            assert b not in refused, f"{TYPES[a][0]} -> {TYPES[b][0]} must be allowed"
    for a, b in VALUE_CHECKED:
        if a == x:
            assert b not in refused, f"{TYPES[a][0]} -> {TYPES[b][0]} is checked value by value, not refused by its types"
            _target(pg_target, [b])
            with pytest.raises(TransferError, match=rf"column y_{b} -> y_{b}: the value .* has more fractional digits than "):
                job({**src, "query": _query(x, [b])}, dst, load_mode="append")
            assert pg_exec(pg_target, "SELECT count(*) FROM cast_matrix")[0][0] == 0
    allowed = [y for y in ys if y not in refused and (x, y) not in TOO_WIDE and (x, y) not in VALUE_CHECKED]
    if y_ch_too_narrow(pg_source, x):
        allowed = [y for y in allowed if y != "ch"]
    if not allowed:
        return
    _target(pg_target, allowed)
    report = job({**src, "query": _query(x, allowed)}, dst, load_mode="append")
    assert report.rows == 3
    got = pg_exec(pg_target, f"SELECT {', '.join(f'y_{y}::text' for y in allowed)} FROM cast_matrix ORDER BY id")
    # what PostgreSQL's own cast makes of each source value, and whether it comes back unchanged
    inner = ", ".join(f"y_{y}::{TYPES[y][0]}::text, (y_{y}::{TYPES[y][0]}::{TYPES[x][0]}::text IS NOT DISTINCT FROM y_{y}::text)"
                      for y in allowed)
    want = pg_exec(pg_source, f"SELECT {inner} FROM ({_query(x, allowed)}) q ORDER BY id")
    for row_got, row_want in zip(got, want):
        for k, y in enumerate(allowed):
            assert row_got[k] == row_want[2 * k], f"{TYPES[x][0]} -> {TYPES[y][0]}: {row_got[k]!r}, PostgreSQL's cast {row_want[2 * k]!r}"
            assert row_want[2 * k + 1], f"{TYPES[x][0]} -> {TYPES[y][0]} is allowed but does not come back unchanged"


def y_ch_too_narrow(server, x: str) -> bool:
    """Whether a sample of X, as text, is longer than char(2) holds (PostgreSQL refuses it then)."""
    values = ", ".join(f"({v})::{TYPES[x][0]}::text" for v in TYPES[x][1])
    return bool(pg_exec(server, f"SELECT max(length(v)) > 2 FROM unnest(ARRAY[{values}]) v")[0][0])


def test_timestamp_into_timestamptz_only_when_asked_and_then_by_postgresql_rule(pg_source, pg_target) -> None:
    """Naive 12:00 into timestamptz: refused by default; with sink.allow_cast, PostgreSQL's cast in
    the session's TimeZone (the target database's America/New_York: 12:00-05), not UTC (main
    wrote 12:00 UTC, i.e. 07:00-05)."""
    pg_exec(pg_target, "DROP DATABASE IF EXISTS tzdb")
    pg_exec(pg_target, "CREATE DATABASE tzdb")
    pg_exec(pg_target, "ALTER DATABASE tzdb SET timezone TO 'America/New_York'")
    pg_exec(pg_target, "CREATE TABLE tzt (id int, ts timestamptz)", dbname="tzdb")
    src = {"type": "postgres", "port": pg_source.port,
           "query": "SELECT 1 AS id, timestamp '2024-01-15 12:00:00' AS ts UNION ALL SELECT 2, NULL"}
    dst = {"type": "postgres", "port": pg_target.port, "dbname": "tzdb", "table": "tzt"}
    with pytest.raises(SchemaError, match=r"column ts \(timestamp without time zone -> timestamp with time zone\)"):
        job(src, dst, load_mode="append")
    assert pg_exec(pg_target, "SELECT count(*) FROM tzt", dbname="tzdb")[0][0] == 0
    report = job(src, {**dst, "allow_cast": ["ts"]}, load_mode="append")
    assert "cast by PostgreSQL (sink.allow_cast): ts" in report.sink_plan.path_reason
    got = pg_exec(pg_target, "SELECT (ts AT TIME ZONE 'UTC')::text FROM tzt ORDER BY id", dbname="tzdb")
    assert got == [("2024-01-15 17:00:00",), (None,)]


def test_typmods_that_differ_are_named_or_refused(pg_source, pg_target) -> None:
    """numeric(10,3) -> numeric(10,2) would round: refused (main passed it through as 'identical
    column types'); varchar(20) -> varchar(30) passes through and the plan says what differs."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS tm_src", "CREATE TABLE tm_src (id int, n numeric(10,3), v varchar(20))",
            "INSERT INTO tm_src VALUES (1, 1.005, 'x')")
    pg_exec(pg_target, "DROP TABLE IF EXISTS tm_dst", "CREATE TABLE tm_dst (id int, n numeric(10,2), v varchar(30))")
    src = {"type": "postgres", "port": pg_source.port, "table": "tm_src"}
    dst = {"type": "postgres", "port": pg_target.port, "table": "tm_dst"}
    with pytest.raises(SchemaError, match=r"column n \(numeric\(10,3\) -> numeric\(10,2\)\): the target keeps fewer digits"):
        job(src, dst, load_mode="append")
    pg_exec(pg_target, "ALTER TABLE tm_dst ALTER COLUMN n TYPE numeric(10,3)")
    report = job(src, dst, load_mode="append")
    assert report.sink_plan.native == "pgcopy-binary"
    assert "typmods differ" in report.sink_plan.path_reason and "v character varying(20) -> character varying(30)" in report.sink_plan.path_reason
    assert pg_exec(pg_target, "SELECT n::text, v FROM tm_dst") == [("1.005", "x")]


@pytest.mark.parametrize("target, refused", [
    ("interval(0)", "fractional seconds 0 < 6"),
    ("interval year to month", "keeps fewer fields"),
    ("interval day to second(6)", "keeps fewer fields"),
    ("interval", None),
])
def test_interval_typmods_that_would_truncate_are_refused(pg_source, pg_target, target: str, refused: str | None) -> None:
    """main passed interval -> interval(0) / YEAR TO MONTH through as the same type: PostgreSQL's
    binary input then rounds the seconds or drops the days without a word."""
    pg_exec(pg_source, "DROP TABLE IF EXISTS iv_src", "CREATE TABLE iv_src (id int, a interval(3), b interval)",
            "INSERT INTO iv_src VALUES (1, '1 year 2 mons 3 days 04:05:06.789', '5 days 00:00:01.5')")
    pg_exec(pg_target, "DROP TABLE IF EXISTS iv_dst", f"CREATE TABLE iv_dst (id int, a interval(3), b {target})")
    src = {"type": "postgres", "port": pg_source.port, "table": "iv_src"}
    dst = {"type": "postgres", "port": pg_target.port, "table": "iv_dst"}
    if refused:
        with pytest.raises(SchemaError, match=rf"column b \(interval -> {re.escape(target)}\): .*{refused}"):
            job(src, dst, load_mode="append")
        assert pg_exec(pg_target, "SELECT count(*) FROM iv_dst") == [(0,)]
        return
    job(src, dst, load_mode="append")
    assert pg_exec(pg_target, "SELECT a::text, b::text FROM iv_dst") == pg_exec(pg_source, "SELECT a::text, b::text FROM iv_src")
