"""Small Arrow helpers shared by connectors. Batches only: never a Python loop over rows."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


def rebatch(batches: Iterable[pa.RecordBatch], batch_size: int) -> Iterator[pa.RecordBatch]:
    """Slice batches larger than ``batch_size`` rows (zero-copy); smaller ones pass as they are."""
    for batch in batches:
        if batch.num_rows <= batch_size:
            if batch.num_rows:
                yield batch
            continue
        for offset in range(0, batch.num_rows, batch_size):
            yield batch.slice(offset, batch_size)


def same_columns(a: pa.Schema, b: pa.Schema) -> bool:
    """Same names and types in the same order (metadata and nullability ignored)."""
    return a.names == b.names and all(x.type == y.type for x, y in zip(a, b))


class CountingBatches:
    """Passes batches through, counting rows and bytes per batch.

    A consumer in native code (DuckDB, a database driver) may wrap an exception raised by the
    producer; ``error`` keeps the original so the sink can re-raise it as it was.
    """

    def __init__(self, batches: Iterable[pa.RecordBatch], schema: pa.Schema | None = None) -> None:
        self._it = iter(batches)
        self._schema = schema
        self.rows = 0
        self.bytes = 0
        self.error: BaseException | None = None

    def __iter__(self) -> CountingBatches:
        return self

    def __next__(self) -> pa.RecordBatch:
        try:
            batch = next(self._it)
            if self._schema is not None and not batch.schema.equals(self._schema):
                batch = conform(batch, self._schema)
        except StopIteration:
            raise
        except BaseException as exc:
            self.error = exc
            raise
        self.rows += batch.num_rows
        self.bytes += batch.nbytes
        return batch


def without_views(schema: pa.Schema) -> pa.Schema:
    """The schema with string_view/binary_view as string/binary (for writers that lack view kernels)."""
    import pyarrow as pa

    def plain(t: pa.DataType) -> pa.DataType:
        if pa.types.is_string_view(t):
            return pa.string()
        if pa.types.is_binary_view(t):
            return pa.binary()
        return t

    return pa.schema([f.with_type(plain(f.type)) for f in schema], metadata=schema.metadata)


def cast_batches(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Each batch cast to ``schema`` (column by column, in Arrow)."""
    for batch in batches:
        yield batch if batch.schema.equals(schema) else batch.cast(schema)


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """The batch with the schema a consumer was promised (a native reader trusts it blindly)."""
    import pyarrow as pa

    from conveyor.errors import SchemaError

    if batch.schema.names != schema.names:
        raise SchemaError(f"a batch has columns {batch.schema.names}, expected {schema.names}")
    try:
        return batch.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaError(f"a batch does not fit the source's schema: {exc}",
                          hint="a column's type changed between batches; cast it in the source query") from None


def negative_zero_checked(batches: Iterable[pa.RecordBatch], key: str, database: str, policy: str) -> Iterator[pa.RecordBatch]:
    """The batches, each float column checked for -0.0 first (its bits: the sign bit alone), for a target that would store
    it as 0: refused by name (``policy``: the setting that stores it as 0 instead). One vectorized comparison per column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from conveyor.errors import TransferError

    for batch in batches:
        for name, arr in zip(batch.schema.names, batch.columns):
            width = {pa.float64(): pa.int64(), pa.float32(): pa.int32()}.get(arr.type)
            if width is None or arr.null_count == len(arr):
                continue
            sign = -(1 << (width.bit_width - 1))
            if pc.any(pc.equal(arr.view(width), sign)).as_py():
                raise TransferError(f"writing {key}: column {name} ({arr.type}) holds -0.0, which {database} stores as 0 (its sign "
                                    "would be lost)", partition=key, hint=f"set {policy} to store it as 0, or change it at the source")
        yield batch


def fraction_checked(batches: Iterable[pa.RecordBatch], checks: Sequence[tuple[str, str, int, str]], key: str,
                     database: str) -> Iterator[pa.RecordBatch]:
    """The batches, each time or timestamp column bound for a target of fewer fractional digits checked first: ``checks``
    are (source column, target column, the digits it keeps, the target type as shown). A value with more digits is
    refused by name (the database would round it); +/-infinity passes. One vectorized remainder per batch."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from conveyor.errors import TransferError
    from conveyor.kit.casts import UNIT_DIGITS

    for batch in batches:
        for s, t, keep, shown in checks:
            arr = batch.column(s)
            if isinstance(arr.type, pa.BaseExtensionType):
                arr = arr.storage
            if not (pa.types.is_time(arr.type) or pa.types.is_timestamp(arr.type)):
                continue  # judged in prepare (casts.py)
            finer = UNIT_DIGITS.get(arr.type.unit, 0) - keep
            if finer <= 0:
                continue
            ticks = arr.cast(pa.int64())
            quantum = pa.scalar(10 ** finer, pa.int64())
            rest = pc.subtract(ticks, pc.multiply(pc.divide(ticks, quantum), quantum))
            finite = pc.and_(pc.less(ticks, pa.scalar(2**63 - 1, pa.int64())), pc.greater(ticks, pa.scalar(-2**63 + 1, pa.int64())))
            bad = pc.and_(pc.not_equal(rest, 0), finite)  # +/-infinity (the unit's farthest values) are no fractions
            if pc.any(bad).as_py():
                first = arr.filter(bad)[0]
                raise TransferError(f"writing {key}: column {s} -> {t}: the value {first} has more fractional digits than {shown} "
                                    f"keeps ({database} would round it)", partition=key,
                                    hint=f"widen {t}'s precision in the target, or round the values in the source (source.query)")
        yield batch


def length_checked(batches: Iterable[pa.RecordBatch], checks: Sequence[tuple[str, str, int, str]], key: str,
                   database: str) -> Iterator[pa.RecordBatch]:
    """The batches, each string column bound for a ``varchar(n)`` / ``char(n)`` target checked first:
    ``checks`` are (source column, target column, n, the target type as shown). A value longer than
    n characters is refused by name: the database would refuse it too, except one whose excess is
    spaces, which PostgreSQL and MySQL both cut off without an error. One vectorized length per batch."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from conveyor.errors import TransferError

    for batch in batches:
        for s, t, n, shown in checks:
            arr = batch.column(s)
            if isinstance(arr.type, pa.BaseExtensionType):
                arr = arr.storage
            if pa.types.is_dictionary(arr.type):
                arr = arr.dictionary_decode()
            if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
                continue  # judged in prepare (casts.py): only text reaches a text column
            longest = pc.max(pc.utf8_length(arr)).as_py()
            if longest is not None and longest > n:
                raise TransferError(f"writing {key}: column {s} -> {t}: a value of {longest} characters is too long for {shown} "
                                    f"({database} would refuse it, or cut its trailing spaces without a word)", partition=key,
                                    hint=f"widen {t} in the target, or shorten the values in the source (source.query)")
        yield batch
