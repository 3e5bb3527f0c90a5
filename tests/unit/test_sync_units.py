"""Sync jobs' pieces that need no server: positions, the default slot name, what a schema change is called, and
the configs refused by name before anything connects."""

from __future__ import annotations

import pytest

from conveyor.config import build_job
from conveyor.connectors.postgres.replication import changed_columns, check_slot_name, lsn, lsn_text, slot_name
from conveyor.errors import ConfigError
from conveyor.pipelines.sync import check, slot_of
from conveyor.submit import compose


def test_positions_read_and_print_as_the_server_does() -> None:
    assert lsn("0/1A751D8") == 0x1A751D8 and lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert lsn_text(lsn("16/B374D848")) == "16/B374D848" and lsn_text(0) == "0/0"


def test_a_schema_change_is_named_column_by_column() -> None:
    before = "id bigint, a text, n numeric(10,2); primary key (id)"
    after = "id bigint, a character varying(100), extra integer; primary key (id, a)"
    assert changed_columns(before, after) == ("column extra added (integer); column n dropped; column a retyped from text to "
                                              "character varying(100); primary key (id) is now primary key (id, a)")


def test_slot_names_are_checked_and_the_default_is_one_per_source_and_target() -> None:
    assert slot_name("a", "b") == slot_name("a", "b") != slot_name("a", "c")
    assert check_slot_name("conveyor_orders_1") == "conveyor_orders_1"
    with pytest.raises(ConfigError, match="is not a slot name"):
        check_slot_name("Orders-Sync")
    base = ["source=postgres", "sink=postgres", "source.table=t", "load_mode=replace", "incremental.method=replication"]
    one, two = (slot_of(build_job(compose([*base, f"sink.table={t}"]))) for t in ("x", "y"))
    assert one != two and one.startswith("conveyor_")
    assert slot_of(build_job(compose([*base, "sink.table=x", "degree=4"]))) == one  # options other than where do not move it
    assert slot_of(build_job(compose([*base, "sink.table=x", "incremental.slot=mine"]))) == "mine"


@pytest.mark.parametrize(("overrides", "says"), [
    (["sink=parquet", "sink.path=/tmp/x", "source.table=t"], "sink parquet cannot apply changes"),
    (["sink=postgres", "sink.table=t", "source.query=SELECT 1"], "the source must be postgres with source.table"),
    (["sink=postgres", "sink.table=t", "source.table=t", "load_mode=append"], "load_mode=append; a sync's first run loads each table"),
])
def test_configs_a_sync_cannot_run_are_refused_before_anything_connects(overrides: list[str], says: str) -> None:
    cfg = compose(["source=postgres", *overrides, "incremental.method=replication"] + ([] if any("load_mode" in o for o in overrides)
                                                                                       else ["load_mode=replace"]))
    with pytest.raises(ConfigError, match=says):
        check(build_job(cfg))


def _tuple_data(*values: bytes | str | None) -> bytes:
    """pgoutput's TupleData: text values ('t'), NULLs ('n'), and 'u' (an unchanged TOASTed value) where given the str 'u'."""
    import struct

    out = struct.pack(">h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == "u":
            out += b"u"
        else:
            out += b"t" + struct.pack(">i", len(v)) + v  # type: ignore[operator]
    return out


def _copy_rows(data: bytes, width: int) -> list[tuple[bytes, ...]]:
    """The rows of binary COPY row data (no header) of ``width`` columns."""
    import struct

    rows, at = [], 0
    while at < len(data):
        (n,) = struct.unpack_from(">h", data, at)
        assert n == width
        at += 2
        row = []
        for _ in range(n):
            (size,) = struct.unpack_from(">i", data, at)
            row.append(data[at + 4:at + 4 + size])
            at += 4 + size
        rows.append(tuple(row))
    return rows


def test_pgoutput_keys_are_read_column_wise_from_every_kind_of_message() -> None:
    """Inserts, updates (plain, with the old key, with the old row), deletes and a TRUNCATE of two tables and one not
    synced, in one batch: each synced table's keys (a two-column key at published positions 0 and 2), in message order; a
    key not carried is counted, not guessed."""
    import struct

    import pyarrow as pa

    from conveyor.connectors.postgres import pgoutput

    def rel(kind: bytes, relid: int) -> bytes:
        return kind + struct.pack(">I", relid)

    a, b, other = 16384, 16390, 99999
    msgs = [
        rel(b"I", a) + b"N" + _tuple_data(b"1", b"x", b"k\t1"),
        rel(b"I", other) + b"N" + _tuple_data(b"9", b"9", b"9"),
        rel(b"U", a) + b"N" + _tuple_data(b"2", "u", b"k2"),  # a TOASTed value left out beside the key
        rel(b"U", a) + b"K" + _tuple_data(b"3", None, b"old\n") + b"N" + _tuple_data(b"4", b"y", "é".encode()),
        rel(b"U", a) + b"O" + _tuple_data(b"5", b"z", b"k5") + b"N" + _tuple_data(b"6", b"z", b"k6"),
        rel(b"D", a) + b"K" + _tuple_data(b"7", None, b""),
        rel(b"D", b) + b"O" + _tuple_data(b"8", b"w", b"k8"),
        rel(b"U", a) + b"N" + _tuple_data(b"10", b"v", "u"),  # the key's second column TOASTed and unchanged: not carried
        b"T" + struct.pack(">I", 2) + b"\x00" + struct.pack(">II", other, b),
    ]
    found: dict[int, pgoutput.TableKeys] = {}
    tables = {a: ((0, 2), 3, False), b: ((0, 2), 3, False)}
    # split over two batches, the second a slice (an offset into its buffers)
    first = pa.array(msgs[:4], pa.binary())
    second = pa.array([b"pad", *msgs[4:]], pa.binary()).slice(1)
    changes = pgoutput.keys_of(first, tables, found, "UTF8") + pgoutput.keys_of(second, tables, found, "UTF8")
    assert changes == 8
    keys_a = [r for rows in found[a].rows for r in _copy_rows(rows, 2)]
    # each batch's first tuples in order, then its updates' new keys after an old key or row
    assert keys_a == [(b"1", b"k\t1"), (b"2", b"k2"), (b"3", b"old\n"), (b"4", "é".encode()),
                      (b"5", b"k5"), (b"7", b""), (b"6", b"k6")]
    assert (found[a].count, found[a].uncarried, found[a].truncated) == (7, 1, False)
    assert [r for rows in found[b].rows for r in _copy_rows(rows, 2)] == [(b"8", b"k8")]
    assert found[b].truncated and other not in found
    with pytest.raises(ValueError, match="carries 2 columns where the table publishes 3"):
        pgoutput.keys_of(pa.array([rel(b"I", a) + b"N" + _tuple_data(b"1", b"x")], pa.binary()), tables, {}, "UTF8")


def test_integer_keys_are_read_as_numbers_made_distinct_in_key_order_and_written_back_as_postgresql_writes_them() -> None:
    """A table whose key columns are all integers: its keys read as numbers (no temporary table on the source), a key
    changed many times one key, the keys in key order (the first column first, negative numbers and int8's ends too),
    cut into ranges written as array literals; a value that is not an integer's text is refused, never guessed."""
    import struct

    import numpy as np
    import pyarrow as pa

    from conveyor.connectors.postgres import pgoutput, replication

    def rel(kind: bytes, relid: int) -> bytes:
        return kind + struct.pack(">I", relid)

    t = 16500
    lo, hi = b"-9223372036854775808", b"9223372036854775807"
    msgs = [
        rel(b"I", t) + b"N" + _tuple_data(b"10", b"x", b"2"),
        rel(b"U", t) + b"N" + _tuple_data(b"10", "u", b"2"),  # the same key again
        rel(b"U", t) + b"K" + _tuple_data(b"-3", None, b"1") + b"N" + _tuple_data(b"7", b"y", b"1"),  # a moved key: both
        rel(b"D", t) + b"K" + _tuple_data(hi, None, b"0"),
        rel(b"I", t) + b"N" + _tuple_data(lo, b"z", b"-32768"),
        rel(b"I", t) + b"N" + _tuple_data(b"10", b"z", b"-1"),
        rel(b"U", t) + b"N" + _tuple_data(b"11", b"v", "u"),  # the key's second column not carried
    ]
    found: dict[int, pgoutput.TableKeys] = {}
    assert pgoutput.keys_of(pa.array(msgs, pa.binary()), {t: ((0, 2), 3, True)}, found) == 7
    keys = found[t]
    assert keys.rows == [] and (keys.count, keys.uncarried) == (7, 1)
    first, second = keys.distinct()
    pairs = list(zip(first.tolist(), second.tolist()))
    assert pairs == [(-2 ** 63, -32768), (-3, 1), (7, 1), (10, -1), (10, 2), (2 ** 63 - 1, 0)]
    chunks = replication._int_chunks([first, second], 4)
    assert chunks == [("{-9223372036854775808,-3}", "{-32768,1}"), ("{7,10}", "{1,-1}"), ("{10}", "{2}"),
                      ("{9223372036854775807}", "{0}")]
    assert pgoutput.decimal_list(np.array([0, -1, 99, 100], dtype=np.int64)) == "0,-1,99,100"
    for bad in (b"1.5", b"", b"-", b" 1", b"12345678901234567890"):
        with pytest.raises(ValueError, match="not an integer's text"):
            pgoutput.keys_of(pa.array([rel(b"I", t) + b"N" + _tuple_data(bad, b"x", b"1")], pa.binary()), {t: ((0, 2), 3, True)}, {})
