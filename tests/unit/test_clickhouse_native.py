"""ClickHouse's Native format written and read back in memory (no server): string lengths whose varints take
one, two and three bytes, NULLs, decimals of each width, arrays and UUIDs. The server's own reading of what
the encoder writes is checked in tests/connectors/test_clickhouse.py."""

from __future__ import annotations

import decimal
import io
import uuid

import pyarrow as pa
import pytest

from conveyor.connectors.clickhouse import native
from conveyor.connectors.clickhouse.types import parse
from conveyor.errors import TransferError


def _roundtrip(batch: pa.RecordBatch, types: list[str], fields: list[pa.Field]) -> pa.Table:
    body = native.encode_block(batch, [(n, parse(t)) for n, t in zip(batch.schema.names, types)])
    return pa.Table.from_batches(list(native.blocks(native.Stream(io.BytesIO(body * 2)), fields)))


def test_strings_of_every_varint_width_and_nulls() -> None:
    values = ["", "é", "x" * 127, "y" * 128, "z" * 16383, "w" * 16384, None, "v" * 70000]
    lens = pa.array([len((v or "").encode()) for v in values], pa.uint64())
    batch = pa.record_batch([lens, pa.array(values)], names=[native.LENGTHS + "s", "s"])
    got = _roundtrip(batch, ["UInt64", "Nullable(String)"], [pa.field("s", pa.string())])
    assert got.column("s").to_pylist() == values * 2


def test_string_views_are_written_as_strings() -> None:
    values = ["a", None, "b" * 300]
    lens = pa.array([len(v or "") for v in values], pa.uint64())
    batch = pa.record_batch([lens, pa.array(values, pa.string_view())], names=[native.LENGTHS + "s", "s"])
    got = _roundtrip(batch, ["UInt64", "Nullable(String)"], [pa.field("s", pa.string())])
    assert got.column("s").to_pylist() == values * 2


def test_decimals_arrays_and_uuids() -> None:
    d9 = pa.array([decimal.Decimal("-9.999"), decimal.Decimal("1.5"), None], pa.decimal128(9, 3))
    d18 = pa.array([decimal.Decimal("-999999999999999.999"), decimal.Decimal("0"), decimal.Decimal("1")], pa.decimal128(18, 3))
    d38 = pa.array([decimal.Decimal("-" + "9" * 38), decimal.Decimal("9" * 38), decimal.Decimal("-1")], pa.decimal128(38, 0))
    arr = pa.array([[1, None], [], [-5]], pa.list_(pa.int32()))
    ids = [uuid.UUID(int=0), uuid.UUID("01234567-89ab-cdef-0123-456789abcdef"), uuid.UUID(int=2**128 - 1)]
    u = pa.ExtensionArray.from_storage(pa.uuid(), pa.array([i.bytes for i in ids], pa.binary(16)))
    batch = pa.record_batch([d9, d18, d38, arr, u], names=["d9", "d18", "d38", "arr", "u"])
    types = ["Nullable(Decimal(9, 3))", "Decimal(18, 3)", "Decimal(38, 0)", "Array(Nullable(Int32))", "UUID"]
    fields = [pa.field("d9", pa.decimal128(9, 3)), pa.field("d18", pa.decimal128(18, 3)), pa.field("d38", pa.decimal128(38, 0)),
              pa.field("arr", pa.list_(pa.int32())), pa.field("u", pa.uuid())]
    got = _roundtrip(batch, types, fields)
    for name in batch.schema.names:
        assert got.column(name).to_pylist() == batch.column(name).to_pylist() * 2, name


def test_values_a_column_cannot_hold_are_refused_by_name() -> None:
    ts = pa.record_batch([pa.array([0, 1_500_000], pa.timestamp("us", tz="UTC"))], names=["when"])
    with pytest.raises(TransferError, match=r"column when \(DateTime\('UTC'\)\) cannot hold the fraction of a second"):
        native.encode_block(ts, [("when", parse("DateTime('UTC')"))])
    big = pa.record_batch([pa.array([2**40], pa.int64())], names=["id"])
    with pytest.raises(TransferError, match=r"column id \(Int32\)"):
        native.encode_block(big, [("id", parse("Int32"))])
    nulls = pa.record_batch([pa.array([1, None], pa.int64())], names=["k"])
    with pytest.raises(TransferError, match=r"column k \(Int64\) cannot hold a NULL"):
        native.encode_block(nulls, [("k", parse("Int64"))])
