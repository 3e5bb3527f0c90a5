"""Two rule sets of the PostgreSQL sink, checked without a server: the client router's hashes and
bounds, and the cast policy's judgements.

The hash reference values below are PostgreSQL 15.20's own (Debian 15.20-0+deb12u1), read once from a
throwaway server with ``SELECT hashint4extended(v, 8816678312871386365)`` (the partition seed,
HASH_PARTITION_SEED) and ``hashint8extended``, and by inserting rows into a table ``PARTITION BY HASH
(a int4, b int8, d date, t timestamp)`` of modulus 7 and reading each row's ``tableoid``. The
integration tests (tests/connectors/postgres/test_routing.py) compare the router with the server's
own routing on every key type; these pin the arithmetic itself and run in milliseconds.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from conveyor.connectors.postgres.parttree import Level, Tree
from conveyor.connectors.postgres.routing import Router, combine64, hash_int8, hash_uint32
from conveyor.errors import SchemaError, TransferError
from conveyor.kit.casts import ColumnType, check_casts, judge

INT4 = {0: -4403592609991167795, 1: 5968994663651403477, -1: -5017072347659237694, 2147483647: -6050265599104649060,
        -2147483648: 4938542303000433043, 123456789: -922921598128084246}
INT8 = {0: -4403592609991167795, 1: 5968994663651403477, -1: -5017072347659237694, 2**40 + 7: -3755892919608028627,
        -(2**40) - 7: -2354240977604690938, 2**63 - 1: 4938542303000433043, -(2**63): -6050265599104649060}


def _signed(h: np.ndarray) -> list[int]:
    return h.view(np.int64).tolist()


def test_the_int_hashes_are_postgresqls() -> None:
    ints = np.array(list(INT4), dtype=np.int32)
    assert _signed(hash_uint32(ints.view(np.uint32))) == list(INT4.values())
    assert _signed(hash_int8(np.array(list(INT8), dtype=np.int64))) == list(INT8.values())


def _hash_tree() -> Tree:
    leaves = tuple(f"h{r}" for r in range(7))
    level = Level("h", "public.h", "hash", ("a", "b", "d", "t"), ("int", "int", "date", "ts"),
                  ("hashint4extended", "hashint8extended", "hashint4extended", "timestamp_hash_extended"),
                  tuple((7, r) for r in range(7)), leaves)
    return Tree(level, leaves)


def test_a_multi_column_hash_with_nulls_picks_postgresqls_partition() -> None:
    """Dates and timestamps in the binary COPY's integers (days, microseconds since 2000); a NULL key
    column adds nothing to the row's hash, all-NULL lands where hash 0 does."""
    rows = [  # a int4, b int8, d days, t microseconds, the partition PostgreSQL 15 put the row in
        (None, None, None, None, "h0"),
        (-5, -1099511627776, -7, -3599999877, "h3"),
        (1, 10, 0, 0, "h4"),
        (None, 3, None, -946684800000000, "h4"),
        (2147483647, 9223372036854775807, 9828, 828059400000000, "h5"),
        (42, None, -36466, None, "h6"),
    ]
    batch = pa.record_batch([pa.array([r[0] for r in rows], pa.int32()), pa.array([r[1] for r in rows], pa.int64()),
                             pa.array([r[2] for r in rows], pa.int32()), pa.array([r[3] for r in rows], pa.int64())],
                            names=["a", "b", "d", "t"])
    tree = _hash_tree()
    assert [tree.destinations[i] for i in Router(tree).assign(batch)] == [r[4] for r in rows]
    assert combine64(np.array([0], np.uint64), np.array([0], np.uint64)).tolist() == [0x49A0F4DD15E5A8E3]


def _range_list_tree(default: bool) -> Tree:
    """A range on id (MINVALUE..0, 0..100, 100..200; a DEFAULT or none), the middle one a list on region."""
    regions = Level("r", "public.r", "list", ("region",), ("text",), (), (("eu", "it's"), ("us", None)), ("r_eu", "r_us"))
    level = Level("t", "public.t", "range", ("id",), ("int",), (), ((None, 0), (0, 100), (100, 200)),
                  ("t_low", regions, "t_high"), "t_default" if default else None)
    return Tree(level, ("t_low", "r_eu", "r_us", "t_high", *(("t_default",) if default else ())))


def test_range_bounds_are_low_inclusive_high_exclusive_and_lists_take_null_where_listed() -> None:
    tree = _range_list_tree(default=True)
    batch = pa.record_batch([pa.array([-(2**63), -1, 0, 50, 99, 99, 100, 199, 200, None], pa.int64()),
                             pa.array(["x", "x", "eu", "it's", None, "us", "x", "x", "x", "x"])], names=["id", "region"])
    got = [tree.destinations[i] for i in Router(tree).assign(batch)]
    assert got == ["t_low", "t_low", "r_eu", "r_eu", "r_us", "r_us", "t_high", "t_high", "t_default", "t_default"]


def test_a_row_no_partition_takes_fails_naming_the_key_not_the_value() -> None:
    tree = _range_list_tree(default=False)
    batch = pa.record_batch([pa.array([5, 250, 251], pa.int64()), pa.array(["eu", "eu", "eu"])], names=["id", "region"])
    with pytest.raises(TransferError, match=r"no partition of relation public.t found for 2 row\(s\) \(partition key id\)") as caught:
        Router(tree).assign(batch)
    assert "251" not in str(caught.value) and "DEFAULT partition" in caught.value.hint


def test_split_groups_a_batchs_rows_by_leaf_keeping_their_order() -> None:
    tree = _range_list_tree(default=True)
    batch = pa.record_batch([pa.array([150, -3, 160, 500, -4], pa.int64()), pa.array(["x"] * 5)], names=["id", "region"])
    parts = {tree.destinations[d]: rows.column(0).to_pylist() for d, rows in Router(tree).split(batch)}
    assert parts == {"t_low": [-3, -4], "t_high": [150, 160], "t_default": [500]}


# --- the cast policy --------------------------------------------------------------------------------


def pg(db: str, sql: str = "", typmod: int = -1, arrow=None) -> ColumnType:  # type: ignore[no-untyped-def]
    return ColumnType(arrow, db=db, sql=sql or db, typmod=typmod)


@pytest.mark.parametrize("src, tgt", [
    (ColumnType(pa.int64()), pg("int4")),                          # checked per value
    (ColumnType(pa.int32()), pg("float8")),
    (ColumnType(pa.float32()), pg("float8")),
    (ColumnType(pa.decimal128(10, 2)), pg("numeric", "numeric(12,4)", (12 << 16 | 4) + 4)),
    (ColumnType(pa.decimal128(10, 0)), pg("int8")),
    (ColumnType(pa.string()), pg("varchar", "varchar(3)", 7)),      # lengths checked before PostgreSQL sees them
    (ColumnType(pa.string()), pg("jsonb")),
    (ColumnType(pa.date32()), pg("timestamp")),
    (ColumnType(pa.timestamp("ms")), pg("timestamp", "timestamp(3)", 3)),
    (ColumnType(pa.timestamp("us", "UTC")), pg("timestamptz")),
    (ColumnType(pa.null()), pg("int4")),
    (ColumnType(pa.string(), db="inet", sql="inet", as_text=True), pg("inet")),
])
def test_casts_that_keep_every_value_are_allowed(src: ColumnType, tgt: ColumnType) -> None:
    assert judge(src, tgt) is None


@pytest.mark.parametrize("src, tgt, why", [
    (ColumnType(pa.float64()), pg("int8"), "change meaning"),
    (ColumnType(pa.float64()), pg("float4"), "float8 -> float4"),
    (ColumnType(pa.decimal128(10, 2)), pg("numeric", "numeric(10,1)", (10 << 16 | 1) + 4), "scale 1 < 2"),
    (ColumnType(pa.decimal128(10, 2)), pg("int4"), "fraction"),
    (ColumnType(pa.timestamp("us")), pg("timestamptz"), "session's time zone"),
    (ColumnType(pa.timestamp("us", "UTC")), pg("timestamp"), "time zone would be dropped"),
    (ColumnType(pa.timestamp("us")), pg("timestamp", "timestamp(3)", 3), "fractional seconds 3 < 6"),
    (ColumnType(pa.string()), pg("int4"), "parsed"),
    (ColumnType(pa.int32()), pg("text"), "formatted as text"),
    (ColumnType(pa.bool_()), pg("int4"), "change meaning"),
    (ColumnType(pa.date32()), pg("int4"), "change meaning"),
    (pg("interval"), pg("interval", "interval(0)", 0x7FFF << 16), "fewer digits"),
    (pg("interval"), pg("interval", "interval year to month", (4 | 2) << 16 | 0xFFFF), "fewer fields"),
])
def test_casts_that_would_change_a_value_are_refused_with_the_reason(src: ColumnType, tgt: ColumnType, why: str) -> None:
    assert why in (judge(src, tgt) or "")


def test_check_casts_names_every_refused_column_and_lets_allow_cast_through() -> None:
    pairs = [("a", "a"), ("b", "b"), ("c", "c")]
    sources = [ColumnType(pa.float64()), ColumnType(pa.int64()), ColumnType(pa.timestamp("us"))]
    targets = [pg("int8"), pg("int8"), pg("timestamptz")]
    with pytest.raises(SchemaError) as caught:
        check_casts(pairs, sources, targets, "table t")
    message = str(caught.value)
    assert message.startswith("table t: column a (double -> int8)") and "and 1 more: column c" in message
    assert "sink.allow_cast=[a,c]" in caught.value.hint, caught.value.hint
    assert check_casts(pairs, sources, targets, "table t", allowed=["a", "c"]) == ["a", "c"]
    assert check_casts(pairs, sources, targets, "table t", allowed=["*"]) == ["a", "c"]
